"""Checks of allocsim's predictions against real allocators: run ``python -m validate --help`` from the repository root."""
