"""Measurement: takes the backends and the machine, and gives what every figure is read against: versions,
devices, which extras can run, analytic FLOPs and the peak FLOP/s that MFU divides by."""
