"""Gradients from backward to the optimizer: backward passes and their hooks (``backward``), accumulation windows
(``accumulation``), the bucket group that owns their communication (``buckets``), stages 2-3's staging buckets
(``staging``), unused parameters (``unused``) and global statistics such as the norm and the overflow flag
(``stats``)."""
