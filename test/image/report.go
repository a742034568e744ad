package image

// ProbeReport is what the probe (./probe) prints, run inside the image.
type ProbeReport struct {
	UID    int   `json:"uid"`
	GID    int   `json:"gid"`
	EUID   int   `json:"euid"`
	EGID   int   `json:"egid"`
	Groups []int `json:"groups"`
	// UserName is the passwd name of UID, or the lookup's error.
	UserName string `json:"userName"`
	// HomeDir is the passwd home of UID.
	HomeDir string `json:"homeDir"`
	// WriteErrors maps each path the probe tried to create to the error, ""
	// when the write succeeded (and was undone).
	WriteErrors map[string]string `json:"writeErrors"`
	// CACertificates counts the PEM certificates of SSL_CERT_FILE (or the
	// Debian path).
	CACertificates int `json:"caCertificates"`
	// TimeZone is the error of loading Europe/Berlin from the image's tzdata, ""
	// when it loaded.
	TimeZone string `json:"timeZone"`
	// Shell is the first of /bin/sh, /bin/bash, /bin/busybox that exists.
	Shell string `json:"shell"`
	// RootEntries are the names at /.
	RootEntries []string `json:"rootEntries"`
	// Env is the process's environment.
	Env []string `json:"env"`
}
