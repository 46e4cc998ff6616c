"""The rewrite rules, one module per family of ``horovod.torch`` names (see each docstring)."""
