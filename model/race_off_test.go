//go:build !race

package model

// raceEnabled is true under the race detector, where the tests that run
// the default-size model do less.
const raceEnabled = false
