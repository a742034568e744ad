//go:build !race

package main

// raceEnabled: the tests run without -race, and so does the relay binary.
const raceEnabled = false
