//go:build race

package vocab

// raceEnabled shortens the random comparisons under the race detector.
const raceEnabled = true
