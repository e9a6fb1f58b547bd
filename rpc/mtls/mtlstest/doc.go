// Package mtlstest gives tests the certificates of a throw-away CA: one
// call writes them (mtls.WriteDir, valid for an hour, DefaultHosts) and
// returns a loader of each role's identity.
package mtlstest
