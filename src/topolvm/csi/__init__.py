"""What every gRPC server of TopoLVM shares: the status-error tree and the call decorator
(``status``), UNIX-socket serving (``server``) and the CSI Identity service (``identity``)."""
