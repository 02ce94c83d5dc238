"""What a round costs, in one place: the cost models (model.py: the analytic Eq. 3.1 model, its fit, and the
measured CostTable), profiling the decoder's own steps into a table (profile.py) and a stopping rule's own
work into it (rules.py), the hardware's cached forward costs the counted cost model prices a decode with
(calibration.py), and the served-throughput prediction from a bundle's acceptance statistics (throughput.py).
It sits above the loops it times; the policies read a table without importing it, and the shapes a round
takes are rounds/shapes.py, below both. A table is per dtype: it records the one its steps ran in.
"""
