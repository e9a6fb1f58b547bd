//go:build !amd64 || noasm

package quant

// otherVNNIForms: no assembly here.
func otherVNNIForms() []vnniTestForm {
	return nil
}
