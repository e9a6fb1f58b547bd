// Package kvsock is the hand-over of a worker's KV memory to the blend
// server (docs/design.md §5): a SOCK_SEQPACKET Unix socket in a directory
// only its owner can enter, on which the worker sends one
// cbv1.KVRegistration with the memory's descriptor attached (SCM_RIGHTS)
// and reads one cbv1.KVRegistered, then keeps the connection open for as
// long as the registration should live. Both sides check the other's
// credentials (SO_PEERCRED): the peer must run as the same user.
//
// The package moves messages and descriptors; what a registration means
// (the mapping, the token, the limits) is the blend server's.
package kvsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// MaxMessage bounds one message on the socket, both ways; a longer one is
// a protocol error.
const MaxMessage = 4096

// maxFDs is how many descriptors one read makes room for; the protocol
// carries one, the rest are closed.
const maxFDs = 4

// ErrProtocol reports a message the protocol does not allow: truncated,
// too long, undecodable, with no descriptor or with several.
var ErrProtocol = errors.New("kvsock: protocol error")

// ErrPeer reports a peer running as another user.
var ErrPeer = errors.New("kvsock: peer runs as another user")

// DefaultPath is the socket `cb blend` listens on and `cb worker` dials by
// default: kv.sock in cb-blend-<uid> under the OS temp directory (created
// 0700 by the server; refused when someone else owns it).
func DefaultPath() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("cb-blend-%d", os.Geteuid()), "kv.sock")
}

// Cred is a peer's credentials as the kernel recorded them when the
// connection was made.
type Cred struct {
	PID      int32
	UID, GID uint32
}

// Listener is the server's socket.
type Listener struct {
	ln     *net.UnixListener
	path   string
	tmpDir string // removed on Close (Listen with an empty path)
}

// Listen creates the socket at path, mode 0600, in a directory that must be
// owned by this user and closed to everyone else (mode 0700 or stricter);
// a missing last directory is created 0700. A socket file left at path by a
// dead server is replaced; one that answers is an error. An empty path
// creates kv.sock in a new private directory under the OS temp directory,
// removed by Close.
func Listen(path string) (*Listener, error) {
	l := &Listener{path: path}
	if path == "" {
		dir, err := os.MkdirTemp("", "cb-blend-")
		if err != nil {
			return nil, fmt.Errorf("kvsock: %w", err)
		}
		l.tmpDir, l.path = dir, filepath.Join(dir, "kv.sock")
	} else {
		if !filepath.IsAbs(path) {
			abs, err := filepath.Abs(path)
			if err != nil {
				return nil, fmt.Errorf("kvsock: %w", err)
			}
			l.path = abs
		}
		if err := privateDir(filepath.Dir(l.path)); err != nil {
			return nil, err
		}
		if err := removeStale(l.path); err != nil {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: l.path, Net: "unixpacket"})
	if err != nil {
		l.cleanup()
		return nil, fmt.Errorf("kvsock: listen %s: %w", l.path, err)
	}
	l.ln = ln
	if err := os.Chmod(l.path, 0o600); err != nil {
		ln.Close()
		l.cleanup()
		return nil, fmt.Errorf("kvsock: %w", err)
	}
	return l, nil
}

// privateDir makes sure dir exists (creating its last element 0700), is a
// real directory (not a symlink), is owned by this user and is closed to
// group and others.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("kvsock: socket directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("kvsock: socket directory: %w", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("kvsock: socket directory %s is not a directory (a symlink?)", dir)
	case st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("kvsock: socket directory %s is owned by uid %d, not %d", dir, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("kvsock: socket directory %s has mode %#o; want 0700 (no access for group or others)", dir, st.Mode&0o777)
	}
	return nil
}

// removeStale removes a socket file at path that nobody listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kvsock: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("kvsock: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unixpacket", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("kvsock: %s is in use by another server", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kvsock: remove stale socket: %w", err)
	}
	return nil
}

func (l *Listener) cleanup() {
	if l.tmpDir != "" {
		os.RemoveAll(l.tmpDir)
	}
}

// Path is the socket's absolute path.
func (l *Listener) Path() string { return l.path }

// Accept waits for the next connection and reads its peer's credentials.
func (l *Listener) Accept() (*Conn, error) {
	c, err := l.ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	conn, err := newConn(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	return conn, nil
}

// Close stops listening and removes the socket (and the directory Listen
// made for an empty path).
func (l *Listener) Close() error {
	err := l.ln.Close() // unlinks the socket file
	l.cleanup()
	return err
}

// Conn is one connection, either side.
type Conn struct {
	c    *net.UnixConn
	cred Cred
}

func newConn(c *net.UnixConn) (*Conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("kvsock: %w", err)
	}
	var uc *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		uc, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("kvsock: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("kvsock: SO_PEERCRED: %w", cerr)
	}
	return &Conn{c: c, cred: Cred{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}}, nil
}

// Peer is the credentials of the process at the other end.
func (c *Conn) Peer() Cred { return c.cred }

// SameUser reports whether the peer runs as this process's effective user.
func (c *Conn) SameUser() bool { return c.cred.UID == uint32(os.Geteuid()) }

// Send writes m as one message before deadline, with f's descriptor
// attached when f is not nil.
func (c *Conn) Send(deadline time.Time, m proto.Message, f *os.File) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("kvsock: %w", err)
	}
	if len(b) == 0 || len(b) > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes", ErrProtocol, len(b))
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	c.c.SetWriteDeadline(deadline)
	n, oobn, err := c.c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("kvsock: send: %w", err)
	}
	if n != len(b) || oobn != len(oob) {
		return fmt.Errorf("kvsock: short send (%d of %d bytes)", n, len(b))
	}
	return nil
}

// Recv reads one message into m before deadline and returns the
// descriptors that came with it (the caller closes them). A truncated or
// undecodable message is an error wrapping ErrProtocol; any descriptor that
// arrived is closed then.
func (c *Conn) Recv(deadline time.Time, m proto.Message) ([]*os.File, error) {
	buf := make([]byte, MaxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	c.c.SetReadDeadline(deadline)
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	files, ferr := parseRights(oob[:oobn])
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	switch {
	case err != nil:
		closeAll()
		return nil, fmt.Errorf("kvsock: receive: %w", err)
	case ferr != nil:
		closeAll()
		return nil, ferr
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > MaxMessage:
		closeAll()
		return nil, fmt.Errorf("%w: message truncated (more than %d bytes or %d descriptors)", ErrProtocol, MaxMessage, maxFDs)
	}
	if err := proto.Unmarshal(buf[:n], m); err != nil {
		closeAll()
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return files, nil
}

// parseRights returns the descriptors of every SCM_RIGHTS message in oob.
func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %v", ErrProtocol, err)
	}
	var files []*os.File
	var perr error
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			perr = fmt.Errorf("%w: control message: %v", ErrProtocol, err)
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "kv-memory"))
		}
	}
	return files, perr
}

// WaitClosed blocks until the peer closes the connection (or Close is
// called); a message from the peer meanwhile is a protocol error and ends
// the wait too (its descriptors are closed).
func (c *Conn) WaitClosed() error {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	c.c.SetReadDeadline(time.Time{})
	n, oobn, _, _, err := c.c.ReadMsgUnix(buf, oob)
	files, _ := parseRights(oob[:oobn])
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: unexpected message of %d bytes", ErrProtocol, n)
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Dial connects to the server's socket at path before ctx ends and checks
// that the server runs as this user (a socket someone else put there would
// otherwise receive the memory).
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("kvsock: dial %s: %w", path, err)
	}
	c, err := newConn(nc.(*net.UnixConn))
	if err != nil {
		nc.Close()
		return nil, err
	}
	if !c.SameUser() {
		nc.Close()
		return nil, fmt.Errorf("%w: %s is served by uid %d", ErrPeer, path, c.cred.UID)
	}
	return c, nil
}

// Register dials the server's socket at path, sends reg with f's
// descriptor attached and reads the answer, all before ctx ends (or within
// 10 s without a deadline). A refusal is returned as a gRPC status error
// with the answer's code. On success the registration lives until the
// returned Conn is closed (by the caller, or by the server: WaitClosed then
// returns).
func Register(ctx context.Context, path string, reg *cbv1.KVRegistration, f *os.File) (*Conn, *cbv1.KVRegistered, error) {
	c, err := Dial(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() }) // cancellation ends the exchange
	var ans cbv1.KVRegistered
	err = c.Send(deadline, reg, f)
	if err == nil {
		var files []*os.File
		files, err = c.Recv(deadline, &ans)
		for _, f := range files {
			f.Close()
		}
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if code := codes.Code(ans.GetCode()); code != codes.OK {
		c.Close()
		return nil, &ans, status.Error(code, "kvsock: registration refused: "+ans.GetMessage())
	}
	return c, &ans, nil
}
