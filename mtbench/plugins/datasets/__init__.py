"""Built-in datasets: aligned Bible translations read from an installed package, never downloaded."""
