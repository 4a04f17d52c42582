"""The real-Kubernetes test bed: pinned Go-built components, a control plane, UML nodes running
real LVM, and a kubelet stand-in. See docs/testing.md."""
