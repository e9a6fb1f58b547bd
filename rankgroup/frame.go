package rankgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame kinds.
const (
	// KindExecute carries a cbv1.ExecuteRequest (rank 0 to a rank).
	KindExecute byte = 'X'
	// KindResponse carries a cbv1.ExecuteResponse (a rank to rank 0).
	KindResponse byte = 'R'
	// KindError carries a rank's Execute error message (UTF-8).
	KindError byte = 'E'
)

// MaxFrame bounds a frame's payload (64 MiB, far above the worker's step
// limits).
const MaxFrame = 64 << 20

// ErrBadFrame reports a frame that is too long, empty or of unknown kind.
var ErrBadFrame = errors.New("rankgroup: bad frame")

// WriteFrame writes one frame of kind with payload.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrBadFrame, len(payload), MaxFrame)
	}
	buf := make([]byte, 5+len(payload))
	binary.LittleEndian.PutUint32(buf, uint32(len(payload)+1))
	buf[4] = kind
	copy(buf[5:], payload)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("rankgroup: write frame: %w", err)
	}
	return nil
}

// ReadFrame reads one frame, checking its length against MaxFrame before
// allocating and its kind against the known kinds. io.EOF means the peer
// closed the stream between frames.
func ReadFrame(r io.Reader) (kind byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("rankgroup: read frame: %w", err)
	}
	n := binary.LittleEndian.Uint32(hdr[:4])
	if n == 0 || n-1 > MaxFrame {
		return 0, nil, fmt.Errorf("%w: length %d outside 1..%d", ErrBadFrame, n, MaxFrame+1)
	}
	if _, err := io.ReadFull(r, hdr[4:5]); err != nil {
		return 0, nil, fmt.Errorf("rankgroup: read frame: %w", io.ErrUnexpectedEOF)
	}
	switch kind = hdr[4]; kind {
	case KindExecute, KindResponse, KindError:
	default:
		return 0, nil, fmt.Errorf("%w: unknown kind %#x", ErrBadFrame, kind)
	}
	payload = make([]byte, n-1)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("rankgroup: read frame payload: %w", io.ErrUnexpectedEOF)
	}
	return kind, payload, nil
}
