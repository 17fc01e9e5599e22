// Package generated holds tests that keep generated and deployment files
// honest: the CRDs, RBAC and deepcopy code committed in the repository must be
// exactly what controller-gen makes from the kubebuilder markers (run
// `make manifests generate` after changing a marker), and the kustomize bases
// under config/ must render into objects a real API server accepts.
package generated
