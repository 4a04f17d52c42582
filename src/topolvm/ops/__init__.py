"""Operator commands that change the cluster with the user's kubeconfig: ``topolvm move``
(one claim to another node) and ``topolvm drain`` (every TopoLVM claim off a node), also as
``kubectl topolvm move|drain``. Both create VolumeMoves and follow them; topolvm-controller
does the moving (docs/mobility.md, "Move")."""
