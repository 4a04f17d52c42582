"""topolvm-controller: CSI Controller service, pod webhook, node/PVC/LogicalVolume controllers."""
