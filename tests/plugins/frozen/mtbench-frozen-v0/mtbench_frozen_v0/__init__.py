"""FROZEN: a plugin written against mtbench's plugin guide before the API had a version (see README.md). Do not
edit: mtbench must keep running this code as it is."""
