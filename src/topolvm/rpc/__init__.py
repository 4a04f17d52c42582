"""What every gRPC server of TopoLVM (lvmd, the CSI node and controller) shares: the
status-error tree and the call decorator (``status``), UNIX-socket serving (``server``) and
per-key call serialisation (``locks``)."""
