package rankgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/tp"
)

// OpenRank is a rank process's side of the descriptors Group passed it: the
// all-reduce segment mapped as rank (SegmentFD) and the step socket
// (StepFD). Both are checked (a regular file with a segment header, a
// socket); the caller closes the reducer and the connection.
func OpenRank(rank int, cfg tp.Config) (*tp.Reducer, net.Conn, error) {
	segFile := os.NewFile(SegmentFD, "tp-segment")
	stepFile := os.NewFile(StepFD, "rank-step")
	if segFile == nil || stepFile == nil {
		return nil, nil, errors.New("rankgroup: descriptors 3 and 4 not inherited")
	}
	defer segFile.Close()
	defer stepFile.Close()
	r, err := tp.OpenSegment(segFile, rank, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("rankgroup: rank %d segment: %w", rank, err)
	}
	conn, err := net.FileConn(stepFile)
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("rankgroup: rank %d step socket: %w", rank, err)
	}
	return r, conn, nil
}

// Serve answers the steps rank 0 forwards on conn with exec until rank 0
// closes the socket (nil) or ctx ends (ctx.Err()); it closes conn on return.
// A malformed frame ends it with an error wrapping ErrBadFrame.
func Serve(ctx context.Context, conn net.Conn, exec Local) error {
	stop := make(chan struct{})
	closed := make(chan struct{})
	go func() { // unblocks the read when ctx ends
		defer close(closed)
		select {
		case <-ctx.Done():
			conn.Close()
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		<-closed
		conn.Close()
	}()
	for {
		kind, body, err := ReadFrame(conn)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if kind != KindExecute {
			return fmt.Errorf("%w: rank 0 sent kind %#x", ErrBadFrame, kind)
		}
		var req cbv1.ExecuteRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			return fmt.Errorf("%w: %w", ErrBadFrame, err)
		}
		resp, err := exec(ctx, &req)
		if err != nil {
			err = WriteFrame(conn, KindError, []byte(err.Error()))
		} else {
			var out []byte
			if out, err = proto.Marshal(resp); err == nil {
				err = WriteFrame(conn, KindResponse, out)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("rankgroup: answer step: %w", err)
		}
	}
}
