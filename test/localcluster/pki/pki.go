// Package pki generates the certificates of the local cluster: one CA, serving
// certificates for kube-apiserver and the node's kubelet API, client certificates
// for the components and the admin, and the service-account signing key.
//
// Everything is generated with crypto/x509 on the spot, ECDSA P-256, valid for a
// year; Ensure keeps what a previous run wrote, so a restarted cluster keeps its
// kubeconfigs and tokens valid.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// validity is how long every certificate of the local cluster is valid.
const validity = 365 * 24 * time.Hour

// Paths of the files Ensure writes, relative to the PKI dir.
const (
	CACert        = "ca.crt"
	CAKey         = "ca.key"
	ServiceAccKey = "sa.key"
	ServiceAccPub = "sa.pub"
)

// Cert describes one leaf certificate.
type Cert struct {
	// Name is the file stem: <name>.crt and <name>.key.
	Name string
	// CommonName and Organizations become the user and groups of a client.
	CommonName    string
	Organizations []string
	// DNSNames and IPs make it a serving certificate.
	DNSNames []string
	IPs      []net.IP
	// Client and Server select the extended key usages.
	Client, Server bool
}

// Files names the PEM files of a certificate.
func Files(dir, name string) (cert, key string) {
	return filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
}

// Ensure creates the CA, the service-account key pair and every cert in dir
// unless they exist already. dir is created with mode 0700.
func Ensure(dir string, certs []Cert) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	caCertPath, caKeyPath := filepath.Join(dir, CACert), filepath.Join(dir, CAKey)
	if !exists(caCertPath) || !exists(caKeyPath) {
		if err := writeCA(caCertPath, caKeyPath); err != nil {
			return err
		}
	}
	ca, caKey, err := loadCA(caCertPath, caKeyPath)
	if err != nil {
		return err
	}
	if !exists(filepath.Join(dir, ServiceAccKey)) {
		if err := writeKeyPair(filepath.Join(dir, ServiceAccKey), filepath.Join(dir, ServiceAccPub)); err != nil {
			return err
		}
	}
	for _, c := range certs {
		certPath, keyPath := Files(dir, c.Name)
		if exists(certPath) && exists(keyPath) {
			continue
		}
		if err := writeLeaf(ca, caKey, c, certPath, keyPath); err != nil {
			return fmt.Errorf("certificate %s: %w", c.Name, err)
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

func writeCA(certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	sn, err := serial()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "outbox-local-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("creating the CA: %w", err)
	}
	return writePair(certPath, der, keyPath, key)
}

func loadCA(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("the CA files hold no PEM block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the CA key: %w", err)
	}
	return cert, key, nil
}

func writeLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, c Cert, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	sn, err := serial()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: c.CommonName, Organization: c.Organizations},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     c.DNSNames,
		IPAddresses:  c.IPs,
	}
	if c.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if c.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(certPath, der, keyPath, key)
}

func writePair(certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeKeyPair writes the service-account signing key and its public half.
func writeKeyPair(keyPath, pubPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}
