//go:build !unix

package gguf

import (
	"fmt"
	"os"
)

// Open reads the file at path into memory (this platform has no mmap
// support here, so every file is opened as with [Resident]), parses and
// validates it.
func Open(path string, _ ...OpenOption) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	return parse(data, path+": ")
}
