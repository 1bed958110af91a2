"""One module per ``allocsim`` subcommand; each has ``register(subparsers)`` and ``main(args) -> int``."""
