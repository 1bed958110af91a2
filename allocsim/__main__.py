"""``python -m allocsim`` is the ``allocsim`` command."""

from .cli import main

raise SystemExit(main())
