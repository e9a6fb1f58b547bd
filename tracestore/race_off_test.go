//go:build !race

package tracestore

// raceEnabled is true under the race detector, where the large tests do less.
const raceEnabled = false
