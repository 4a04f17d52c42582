"""``topolvm doctor``: reads a cluster, read-only, and names why a pod or volume is stuck."""
