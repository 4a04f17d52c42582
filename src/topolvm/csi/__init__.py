"""What the two CSI plugins (topolvm-node and topolvm-controller) share: the CSI Identity
service (``identity``)."""
