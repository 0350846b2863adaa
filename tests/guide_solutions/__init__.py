"""Solutions of the guide's exercises (docs/guide/*.md, "Exercise"), checked by tests/test_guide.py with
the checker each chapter defines."""
