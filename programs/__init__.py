"""Example structgen programs. Each is tested on the embedded model (tests/test_programs.py)."""
