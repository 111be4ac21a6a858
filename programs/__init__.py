"""Example structgen programs. Each is tested on the embedded model (tests/lang/test_programs.py)."""
