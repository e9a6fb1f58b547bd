//go:build !unix

package httpserve

// fdLimit returns 0: the open-file limit is not known on this platform.
func fdLimit() uint64 { return 0 }
