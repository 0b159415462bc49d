"""Planning without a cluster: the paper's memory and communication analysis, dry runs of the real engine
on the fake process-group backend, and a stated performance model."""
