//go:build race

package main

// raceEnabled: the tests run with -race, so the relay binary is built with
// -race too, and a data race in it fails the test that ran it.
const raceEnabled = true
