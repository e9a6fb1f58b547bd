package blend

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
)

// The attacks of issue 12, replayed through the real gRPC port and the KV
// socket.

// fileWithPattern writes a file of the layout's size holding a known
// pattern and returns its path and content.
func fileWithPattern(t *testing.T, dir, name string) (string, []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("precious"), int(testLayout.Bytes())/8)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, data
}

// oldRegisterKV calls the removed path-based RegisterKV with the wire form
// of its old request (worker_id 1, rank 2, shm_path 3, layout 4, model 5).
func oldRegisterKV(ctx context.Context, conn *grpc.ClientConn, id, path string) error {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, id)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, path)
	lb, _ := proto.Marshal(registration(id, 0, testLayout).GetLayout())
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendBytes(b, lb)
	req := &emptypb.Empty{}
	req.ProtoReflect().SetUnknown(b)
	return conn.Invoke(ctx, "/cacheblend.v1.BlendService/RegisterKV", req, &emptypb.Empty{})
}

// Attack 1, file overwrite: a registration naming a file by path (outside
// the memory directory, a symlink, a hard link) no longer exists; nothing
// the server does afterwards touches the file.
func TestRegisterByPathIsGone(t *testing.T) {
	e := newEnv(t, Config{})
	dir := t.TempDir()
	victim, want := fileWithPattern(t, dir, "cb-kv-1-0000000000000001.shm")
	outside, wantOutside := fileWithPattern(t, t.TempDir(), "cb-kv-2-0000000000000002.shm")
	link := filepath.Join(dir, "cb-kv-3-0000000000000003.shm")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "cb-kv-4-0000000000000004.shm")
	if err := os.Link(victim, hard); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(e.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxT(t)
	for _, p := range []string{victim, outside, link, hard} {
		if err := oldRegisterKV(ctx, conn, "atk", p); status.Code(err) != codes.Unimplemented {
			t.Fatalf("RegisterKV(%s): %v, want Unimplemented", p, err)
		}
	}
	if n := e.s.Stats().Workers; n != 0 {
		t.Fatalf("%d registrations after path registrations", n)
	}
	// The retrieve that wrote chunk bytes into the named file finds nothing
	// to write into.
	_, err = e.raw.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "atk", WorkerId: "atk", BlockTable: blocks(0, 4),
		RegistrationToken: make([]byte, TokenBytes)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retrieve into the unregistered file: %v", err)
	}
	for p, w := range map[string][]byte{victim: want, outside: wantOutside} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, w) {
			t.Fatalf("%s changed (%v)", p, err)
		}
	}
}

// memfdOf returns a read-write memfd of size bytes.
func memfdOf(t *testing.T, size int64) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("atk", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "atk")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

// sendRaw sends b with files attached on a fresh connection to the KV
// socket and returns the server's answer (code 0 and a token on success).
func sendRaw(t *testing.T, e *env, b []byte, files ...*os.File) *cbv1.KVRegistered {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.s.KVSocket(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, kvsock.MaxMessage)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var ans cbv1.KVRegistered
	if err := proto.Unmarshal(buf[:n], &ans); err != nil {
		t.Fatal(err)
	}
	return &ans
}

// Descriptors and messages the server refuses on the KV socket; none of
// them leaves a registration, a mapping or a descriptor behind, and a
// good registration still works afterwards.
func TestKVSocketRefusesBadRegistrations(t *testing.T) {
	e := newEnv(t, Config{KVHandshakeTimeout: 300 * time.Millisecond})
	reg, _ := proto.Marshal(registration("atk", 0, testLayout))
	dir := t.TempDir()
	roPath, _ := fileWithPattern(t, dir, "ro")
	ro, err := os.Open(roPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	good := memfdOf(t, testLayout.Bytes())
	badLayout := registration("atk", 0, testLayout)
	badLayout.Layout.NumLayers = 0
	badLayoutB, _ := proto.Marshal(badLayout)
	oddHead := registration("atk", 0, kvcache.Layout{NumLayers: 2, NumBlocks: 160, BlockSize: bs, KVHeads: 16, HeadDim: 1})
	oddHeadB, _ := proto.Marshal(oddHead)
	badType := registration("atk", 0, testLayout)
	badType.Layout.Dtype = "q8_0"
	badTypeB, _ := proto.Marshal(badType)
	half := testLayout
	half.DType = kvcache.F16
	halfB, _ := proto.Marshal(registration("atk", 0, half))
	noID, _ := proto.Marshal(registration("", 0, testLayout))
	longID, _ := proto.Marshal(registration(strings.Repeat("x", MaxWorkerIDLen+1), 0, testLayout))
	badRank, _ := proto.Marshal(registration("atk", MaxWorldSize, testLayout))
	type attempt struct {
		name  string
		b     []byte
		files []*os.File
	}
	attempts := []attempt{
		{"descriptor too small", reg, []*os.File{memfdOf(t, testLayout.Bytes()-4096)}},
		{"descriptor too large", reg, []*os.File{memfdOf(t, testLayout.Bytes()+4096)}},
		{"empty descriptor (4 KB file)", reg, []*os.File{memfdOf(t, 4096)}},
		{"read-only file", reg, []*os.File{ro}},
		{"pipe", reg, []*os.File{pr}},
		{"no descriptor", reg, nil},
		{"two descriptors", reg, []*os.File{good, good}},
		{"bad layout", badLayoutB, []*os.File{good}},
		{"odd head dim", oddHeadB, []*os.File{good}},
		{"unknown element type", badTypeB, []*os.File{good}},
		{"f16 layout, descriptor sized for f32", halfB, []*os.File{good}},
		{"no worker id", noID, []*os.File{good}},
		{"worker id too long", longID, []*os.File{good}},
		{"rank out of range", badRank, []*os.File{good}},
		{"not a protobuf", []byte{0xff, 0xff, 0xff, 0xff}, []*os.File{good}},
		{"message too long", append(reg, bytes.Repeat([]byte{0}, kvsock.MaxMessage)...), []*os.File{good}},
	}
	fdsBefore := openFDs(t)
	mapsBefore := kvMappings(t)
	for _, tc := range attempts {
		t.Run(tc.name, func(t *testing.T) {
			ans := sendRaw(t, e, tc.b, tc.files...)
			if codes.Code(ans.GetCode()) != codes.InvalidArgument || len(ans.GetRegistrationToken()) != 0 {
				t.Fatalf("answer %v, want INVALID_ARGUMENT without a token", ans)
			}
		})
	}
	// A peer that connects and says nothing is dropped after the handshake
	// timeout.
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.s.KVSocket(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, kvsock.MaxMessage)
	n, err := c.Read(buf)
	var ans cbv1.KVRegistered
	if err != nil || proto.Unmarshal(buf[:n], &ans) != nil || codes.Code(ans.GetCode()) != codes.InvalidArgument {
		t.Fatalf("silent peer: %v %v", err, &ans)
	}
	c.Close()
	waitFor(t, "every refused connection closed", func() bool { return e.s.Stats().KVConnections == 0 })
	if st := e.s.Stats(); st.Workers != 0 || st.KVRegistrationsRefused != 17 {
		t.Fatalf("stats %+v", st)
	}
	// Every descriptor the server received was closed, nothing stayed mapped.
	if got := openFDs(t); got > fdsBefore {
		t.Fatalf("%d descriptors open, %d before: the server kept refused descriptors", got, fdsBefore)
	}
	if got := kvMappings(t); got != mapsBefore {
		t.Fatalf("%d memfd mappings, %d before", got, mapsBefore)
	}
	// Later requests are correct.
	e.s.waitRegistrations(t)
	checkReuse(t, e)
}

// checkReuse registers a worker, stores a document from its memory and
// retrieves it: the data path works.
func checkReuse(t *testing.T, e *env) {
	t.Helper()
	id := fmt.Sprintf("good-%d", time.Now().UnixNano())
	mem := e.newWorker(id, 0)
	doc := tokens(rand.New(rand.NewPCG(3, 4)), docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	e.prefill(mem, bt, docSeq, docLen)
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "good", WorkerId: id, Tokens: doc, BlockTable: bt, Model: testModel}); err != nil {
		t.Fatal(err)
	}
	e.s.waitRegistrations(t)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "good", Tokens: promptWith(promptN, 64, doc, 5), WorldSize: 1, Model: testModel})
	tbt := targetTable(promptN / bs)
	if _, err := e.c.Retrieve(ctxT(t), &cbv1.RetrieveRequest{RequestId: "good", WorkerId: id, BlockTable: tbt, Matches: res.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	e.checkSlots(mem, tbt, 64, docLen, 0)
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("no /proc (the KV hand-over is Linux only): %v", err)
	}
	return len(ents)
}

// kvMappings counts this process's mappings of memfds and of files under
// the test's temporary directories.
func kvMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatalf("no /proc (the KV hand-over is Linux only): %v", err)
	}
	return strings.Count(string(b), "/memfd:")
}

// Attacks 2 and 3, reading another client's prompt and poisoning the
// cache: with only the victim's worker id (public through the worker's
// Info), Store and Retrieve against its memory are PERMISSION_DENIED —
// without a token, with a made-up one, with the attacker's own
// registration's token. Nothing is stored, nothing is written.
func TestAnotherPeersMemoryNeedsItsToken(t *testing.T) {
	e, victim, doc := docEnv(t, Config{})
	// The victim's prompt sits in blocks 20..144 of its memory.
	secret := targetTable(promptN / bs)
	e.prefill(victim, secret, 42, promptN)
	before := snapshot(victim)
	atkMem := newMem(t)
	_, atkToken := e.register("atk", 0, atkMem)
	chunksBefore := e.s.Stats().Store.L1Chunks
	ctx := ctxT(t)
	whole := blocks(0, testLayout.NumBlocks)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "atk", Tokens: promptWith(promptN, 64, doc, 5), WorldSize: 1, Model: testModel})
	for name, tok := range map[string][]byte{
		"no token":                     nil,
		"short token":                  []byte("guess"),
		"made-up token":                bytes.Repeat([]byte{7}, TokenBytes),
		"the attacker's token":         atkToken,
		"a token one bit off":          flipBit(e.tokens[workerKey{"w0", 0}]),
		"the victim's token cut short": e.tokens[workerKey{"w0", 0}][:TokenBytes-1],
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.raw.Store(ctx, &cbv1.StoreRequest{RequestId: "steal", WorkerId: "w0", Tokens: make([]int32, len(whole)*bs),
				BlockTable: whole, Model: testModel, RegistrationToken: tok})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("store of the victim's whole pool: %v", err)
			}
			_, err = e.raw.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "poison", WorkerId: "w0", BlockTable: secret,
				Matches: res.GetMatches(), RegistrationToken: tok})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("retrieve into the victim's memory: %v", err)
			}
			_, err = e.raw.UnregisterKV(ctx, &cbv1.UnregisterKVRequest{WorkerId: "w0", RegistrationToken: tok})
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("unregister the victim: %v", err)
			}
		})
	}
	if got := e.s.Stats(); got.Store.L1Chunks != chunksBefore || got.Workers != 2 {
		t.Fatalf("after the attacks: %d chunks (%d before), %d registrations", got.Store.L1Chunks, chunksBefore, got.Workers)
	}
	if !bytes.Equal(snapshot(victim), before) {
		t.Fatal("the victim's memory changed")
	}
	// The attacker's own registration works on its own memory only: the
	// victim's key with the attacker's token, or the attacker's key with
	// the victim's blocks of another memory, reads nothing of the victim.
	if _, err := e.raw.Store(ctx, &cbv1.StoreRequest{RequestId: "own", WorkerId: "atk", Tokens: make([]int32, len(whole)*bs),
		BlockTable: whole, Model: testModel, RegistrationToken: atkToken}); err != nil {
		t.Fatal(err)
	}
	keys := chunkstore.ChainKeys(testModel, 0, make([]int32, len(whole)*bs), 256)
	c, _ := e.s.chunks.store.GetMany(keys[:1])
	if ch := c[keys[0]]; ch == nil || ch.K(0)[0] != sentinel {
		t.Fatal("the attacker's store did not come from the attacker's memory")
	}
	// The victim's own requests are correct.
	if _, err := e.c.Retrieve(ctx, &cbv1.RetrieveRequest{RequestId: "victim", WorkerId: "w0", BlockTable: secret, Matches: res.GetMatches()}); err != nil {
		t.Fatal(err)
	}
	for i := range docLen {
		pos := 64 + i
		slot := int(secret[pos/bs])*bs + pos%bs
		if got := victim.TokenV(0, slot)[0]; got != rawV(docSeq, i, 0, 0) {
			t.Fatalf("victim retrieve: position %d V %v", pos, got)
		}
	}
}

func flipBit(b []byte) []byte {
	c := append([]byte(nil), b...)
	c[len(c)-1] ^= 1
	return c
}

func snapshot(mem *kvcache.Memory) []byte {
	var buf bytes.Buffer
	for layer := range mem.Layout().NumLayers {
		for _, p := range [][]float32{mem.K(layer), mem.V(layer)} {
			for _, f := range p {
				fmt.Fprint(&buf, f, ",")
			}
		}
	}
	return buf.Bytes()
}

// Attack 4, the registration flood: registrations stop at the caps (per
// peer, and in total with handshaking connections counted), a stream of
// registrations that come and go never leaves a mapping, a descriptor or a
// connection behind, and the server stays alive and correct.
func TestRegistrationFloodStopsAtTheCap(t *testing.T) {
	mem := newMem(t)
	ctx := ctxT(t)
	t.Run("per peer", func(t *testing.T) {
		const perPeer = 5
		e := newEnv(t, Config{MaxKVRegistrations: 8, MaxKVRegistrationsPerPeer: perPeer})
		mapsBefore := kvMappings(t)
		var held []*kvsock.Conn
		refused := 0
		for i := range 1000 {
			c, _, err := kvsock.Register(ctx, e.s.KVSocket(), registration(fmt.Sprintf("flood-%d", i), 0, testLayout), mem.File())
			if err != nil {
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("registration %d: %v", i, err)
				}
				refused++
				continue
			}
			held = append(held, c)
		}
		if len(held) != perPeer || refused != 1000-perPeer {
			t.Fatalf("%d registrations held, %d refused; want %d and %d", len(held), refused, perPeer, 1000-perPeer)
		}
		if got := kvMappings(t) - mapsBefore; got != perPeer {
			t.Fatalf("%d mappings for %d registrations", got, perPeer)
		}
		for _, c := range held {
			c.Close()
		}
		waitFor(t, "the registrations released", func() bool {
			st := e.s.Stats()
			return st.Workers == 0 && st.KVConnections == 0 && kvMappings(t) == mapsBefore
		})
		checkReuse(t, e)
	})
	t.Run("in total, handshaking included", func(t *testing.T) {
		const total = 3
		e := newEnv(t, Config{MaxKVRegistrations: total, MaxKVRegistrationsPerPeer: 100, KVHandshakeTimeout: 30 * time.Second})
		var silent []*net.UnixConn
		for range total {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.s.KVSocket(), Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			silent = append(silent, c)
		}
		waitFor(t, "the silent connections counted", func() bool { return e.s.Stats().KVConnections == total })
		for range 200 {
			if _, _, err := kvsock.Register(ctx, e.s.KVSocket(), registration("one-more", 0, testLayout), mem.File()); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("registration beyond the cap: %v", err)
			}
		}
		for _, c := range silent {
			c.Close()
		}
		waitFor(t, "the silent connections closed", func() bool { return e.s.Stats().KVConnections == 0 })
		checkReuse(t, e)
	})
	t.Run("churn", func(t *testing.T) {
		e := newEnv(t, Config{})
		mapsBefore := kvMappings(t)
		fdsBefore := openFDs(t)
		for i := range 3000 {
			c, _, err := kvsock.Register(ctx, e.s.KVSocket(), registration("churn", 0, testLayout), mem.File())
			if err != nil {
				t.Fatalf("registration %d: %v", i, err)
			}
			c.Close()
		}
		waitFor(t, "the churn released", func() bool {
			st := e.s.Stats()
			return st.Workers == 0 && st.KVConnections == 0 && kvMappings(t) == mapsBefore && openFDs(t) <= fdsBefore
		})
		checkReuse(t, e)
	})
}

// A peer running as another user is refused even when the socket's
// directory has been opened to everyone (by default it cannot even
// connect). Needs root to run the peer as nobody.
func TestKVSocketRefusesAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test runs a peer as another user, which needs root: run the suite as root (CI does)")
	}
	e := newEnv(t, Config{})
	// The test binary, where nobody can run it.
	binDir, err := os.MkdirTemp("", "cb-kvsock-peer-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(binDir)
	bin := filepath.Join(binDir, "blend.test")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "CB_KVSOCK_CHILD="+e.s.KVSocket())
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return fmt.Sprintf("%s(exit: %v)", out, err)
	}
	if out := run(); !strings.Contains(out, "RESULT dial refused") {
		t.Fatalf("another user reached the private socket:\n%s", out)
	}
	// Open the directory and the socket to everyone: SO_PEERCRED still
	// refuses the peer.
	if err := os.Chmod(filepath.Dir(e.s.KVSocket()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.s.KVSocket(), 0o777); err != nil {
		t.Fatal(err)
	}
	if out := run(); !strings.Contains(out, "RESULT PermissionDenied token=0") {
		t.Fatalf("another user's registration:\n%s", out)
	}
	if st := e.s.Stats(); st.Workers != 0 || st.KVRegistrationsRefused != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// kvsockPeer is the other user's process of TestKVSocketRefusesAnotherUser
// (the test binary run by it with CB_KVSOCK_CHILD set; TestMain dispatches
// here): it sends a registration with a memfd on a raw connection to the
// socket at path (kvsock.Dial would refuse a server of another user).
func kvsockPeer(path string) {
	mem, err := kvcache.Create("", testLayout)
	if err != nil {
		fmt.Println("RESULT create:", err)
		return
	}
	defer mem.Close()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		fmt.Println("RESULT dial refused:", err)
		return
	}
	defer c.Close()
	b, _ := proto.Marshal(registration("other-user", 0, testLayout))
	if _, _, err := c.WriteMsgUnix(b, unix.UnixRights(int(mem.File().Fd())), nil); err != nil {
		fmt.Println("RESULT send:", err)
		return
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, kvsock.MaxMessage)
	n, err := c.Read(buf)
	var ans cbv1.KVRegistered
	if err != nil || proto.Unmarshal(buf[:n], &ans) != nil {
		fmt.Println("RESULT no answer:", err)
		return
	}
	fmt.Printf("RESULT %s token=%d\n", codes.Code(ans.GetCode()), len(ans.GetRegistrationToken()))
}
