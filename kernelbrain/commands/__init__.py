"""The `kb` subcommands, one module per concern; kernelbrain.cli gathers them into one group."""
