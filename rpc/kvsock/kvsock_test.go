package kvsock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

func TestListenPrivateTempDir(t *testing.T) {
	l, err := Listen("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(l.Path())
	if m := mode(t, dir); m.Perm() != 0o700 || !m.IsDir() {
		t.Fatalf("directory mode %v", m)
	}
	if m := mode(t, l.Path()); m.Type() != os.ModeSocket || m.Perm() != 0o600 {
		t.Fatalf("socket mode %v", m)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory left after Close: %v", err)
	}
}

func TestListenChecksTheDirectory(t *testing.T) {
	base := t.TempDir()
	// A missing last directory is created 0700.
	p := filepath.Join(base, "new", "kv.sock")
	l, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Dir(p)); m.Perm() != 0o700 {
		t.Fatalf("created directory mode %v", m)
	}
	l.Close()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}

	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o755)
	link := filepath.Join(base, "link")
	private := filepath.Join(base, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(private, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"directory open to others": filepath.Join(open, "kv.sock"),
		"symlinked directory":      filepath.Join(link, "kv.sock"),
		"a file at the path":       file,
		"parent missing":           filepath.Join(base, "a", "b", "kv.sock"),
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases["directory of another user"] = filepath.Join(other, "kv.sock")
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			if l, err := Listen(p); err == nil {
				l.Close()
				t.Fatalf("Listen(%s) succeeded", p)
			}
		})
	}
}

func TestListenReplacesAStaleSocketOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "kv.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd) // a dead server's socket file: nobody listens
	l, err := Listen(p)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer l.Close()
	if l2, err := Listen(p); err == nil || !strings.Contains(err.Error(), "in use") {
		if l2 != nil {
			l2.Close()
		}
		t.Fatalf("second Listen on a live socket: %v", err)
	}
}

// A registration round trip: the descriptor arrives, the server sees the
// client's credentials, a refusal comes back as a status error.
func TestRegisterRoundTrip(t *testing.T) {
	l, err := Listen("")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	mf := os.NewFile(uintptr(fd), "t")
	defer mf.Close()
	if err := mf.Truncate(8192); err != nil {
		t.Fatal(err)
	}
	type got struct {
		cred  Cred
		id    string
		size  int64
		nfile int
		err   error
	}
	ch := make(chan got, 2)
	go func() {
		for i := range 2 {
			c, err := l.Accept()
			if err != nil {
				ch <- got{err: err}
				return
			}
			var r cbv1.KVRegistration
			files, err := c.Recv(time.Now().Add(5*time.Second), &r)
			g := got{cred: c.Peer(), id: r.GetWorkerId(), nfile: len(files), err: err}
			if len(files) > 0 {
				st, _ := files[0].Stat()
				g.size = st.Size()
			}
			for _, f := range files {
				f.Close()
			}
			ans := &cbv1.KVRegistered{RegistrationToken: make([]byte, 32)}
			if i == 1 {
				ans = &cbv1.KVRegistered{Code: int32(codes.ResourceExhausted), Message: "full"}
			}
			c.Send(time.Now().Add(5*time.Second), ans, nil)
			if i == 0 {
				c.WaitClosed()
			}
			c.Close()
			ch <- g
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, ans, err := Register(ctx, l.Path(), &cbv1.KVRegistration{WorkerId: "w"}, mf)
	if err != nil || len(ans.GetRegistrationToken()) != 32 {
		t.Fatalf("Register: %v %v", ans, err)
	}
	c.Close()
	g := <-ch
	if g.err != nil || g.id != "w" || g.nfile != 1 || g.size != 8192 || g.cred.PID != int32(os.Getpid()) || g.cred.UID != uint32(os.Geteuid()) {
		t.Fatalf("server saw %+v", g)
	}
	if _, _, err := Register(ctx, l.Path(), &cbv1.KVRegistration{WorkerId: "w2"}, mf); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("refused registration: %v", err)
	}
	<-ch
}
