"""Regex-constrained generation: an IPv4 address and an ISO date."""

import structgen as sg

IPV4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
ISO_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"


@sg.program
def regex_gen(s, host):
    s += f"The IP address of {host} is " + sg.gen("ip", regex=IPV4, max_tokens=20) + ".\n"
    s += "It was first registered on " + sg.gen("date", regex=ISO_DATE, max_tokens=12) + ".\n"


if __name__ == "__main__":
    state = regex_gen.run(host="example.org")
    print(state["ip"], state["date"])
