"""Runs in processes of their own: compare's plan, its children and their interleaved repeats, and rerun's."""
