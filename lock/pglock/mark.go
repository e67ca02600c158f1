package pglock

import (
	"crypto/md5" //nolint:gosec // a short name for notifications, not a secret
	"encoding/hex"
)

// mark is fencekit_lock_mark: the first 16 hex digits of the MD5 of id. A
// notification names resources and holders by their marks, which are
// short, fit any resource name in a payload, and do not let a listener
// release or extend a lock (only the holder id does).
func mark(id string) string {
	sum := md5.Sum([]byte(id)) //nolint:gosec // see above
	return hex.EncodeToString(sum[:8])
}
