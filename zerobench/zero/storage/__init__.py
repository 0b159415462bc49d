"""Where a rank's parameters live: the flat buffers a ``PartitionLayout`` lays out (``buffer``), one vocabulary for
the replica, this rank's shards, the fp32 master and the host partition (``params.ParamStorage``), where each
partition is placed (``placement``) and how the engine allocates outside the plain path (``allocator``)."""
