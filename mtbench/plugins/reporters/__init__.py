"""Built-in reporters: the terminal table of one run."""
