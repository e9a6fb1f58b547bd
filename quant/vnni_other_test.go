//go:build !amd64 || noasm

package quant

// otherVNNIForms: no assembly here.
func otherVNNIForms() []struct {
	name string
	form int
} {
	return nil
}
