"""topolvm-scheduler: the kube-scheduler extender that filters and scores nodes by free capacity."""
