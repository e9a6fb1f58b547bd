package llamaref

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// cpuLib matches a prebuilt llama.cpp CPU backend's file name; group 1 is its variant.
var cpuLib = regexp.MustCompile(`^libggml-cpu-([a-z0-9_]+)\.so$`)

// variantTree returns dir/cpu-<v>, a reference directory whose node_modules holds the files of
// dir/node_modules (hard links, so no space is spent) except the CPU backends of variants other
// than v, making it the first time. It fails when no libggml-cpu-<v>.so is installed, naming
// the variants that are.
func variantTree(dir, v string) (string, error) {
	mods := filepath.Join(dir, "node_modules")
	var have []string
	err := filepath.WalkDir(mods, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if m := cpuLib.FindStringSubmatch(d.Name()); m != nil && !d.IsDir() && !slices.Contains(have, m[1]) {
			have = append(have, m[1])
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("llamaref: list CPU backends: %w", err)
	}
	if !slices.Contains(have, v) {
		slices.Sort(have)
		return "", fmt.Errorf("llamaref: no llama.cpp CPU backend %q in %s (installed: %s)", v, mods, strings.Join(have, ", "))
	}
	out := filepath.Join(dir, "cpu-"+v)
	if _, err := os.Stat(filepath.Join(out, "node_modules")); err == nil {
		return out, nil
	}
	// Built beside the final tree and renamed into place, so that an interrupted build is
	// never taken for a finished one.
	tmp, err := os.MkdirTemp(dir, ".cpu-"+v+"-")
	if err != nil {
		return "", fmt.Errorf("llamaref: variant tree: %w", err)
	}
	defer os.RemoveAll(tmp)
	err = filepath.WalkDir(mods, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(tmp, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		}
		if m := cpuLib.FindStringSubmatch(d.Name()); m != nil && m[1] != v {
			return nil
		}
		return os.Link(p, dst)
	})
	if err != nil {
		return "", fmt.Errorf("llamaref: variant tree %s: %w", v, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", fmt.Errorf("llamaref: variant tree: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, "node_modules"), filepath.Join(out, "node_modules")); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("llamaref: variant tree: %w", err)
	}
	return out, nil
}
