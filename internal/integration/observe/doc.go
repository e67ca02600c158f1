// Package observe holds the tests of fencekit's OpenTelemetry instruments,
// read through the SDK's in-memory reader and span recorder. It installs the
// SDK as the global providers, so it has a test binary of its own.
package observe
