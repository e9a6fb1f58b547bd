package blend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
)

// Registered sequences kept in L2 (docs/design.md §3): the fingerprint
// table lives in memory, so without them a restarted blend server would
// hold a document's chunks in L2 but never match the document at another
// position. Each registered rank-0 sequence is written to
// <L2Dir>/sequences/<last chunk key>.seq and registered again at start-up
// when all its chunks are still in L2 (the file is removed otherwise).
const (
	seqDirName = "sequences" // under the L2 directory
	seqExt     = ".seq"
	seqMagic   = "CBS1" // starts a sequence file
	// MaxSequenceFileBytes bounds a sequence file read at start-up.
	MaxSequenceFileBytes = 16 + chunkstore.MaxModelLen + 12 + 4*fleet.MaxSequenceTokens + 32*fleet.MaxSequenceTokens + 8
)

// errBadSequenceFile marks a sequence file that does not decode.
var errBadSequenceFile = errors.New("blend: corrupt sequence file")

var seqCRC = crc32.MakeTable(crc32.Castagnoli)

// encodeSequenceFile is magic, model length, model, the fleet encoding of
// seq, and a CRC32C of all that.
func encodeSequenceFile(model string, seq fingerprint.Sequence) []byte {
	enc := fleet.EncodeSequence(seq)
	b := make([]byte, 0, len(seqMagic)+4+len(model)+len(enc)+4)
	b = append(b, seqMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(model)))
	b = append(b, model...)
	b = append(b, enc...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, seqCRC))
}

// decodeSequenceFile parses and bounds a sequence file: the model name (at
// most chunkstore.MaxModelLen bytes) and the sequence.
func decodeSequenceFile(b []byte) (string, fingerprint.Sequence, error) {
	var seq fingerprint.Sequence
	if len(b) < len(seqMagic)+8 || string(b[:len(seqMagic)]) != seqMagic ||
		crc32.Checksum(b[:len(b)-4], seqCRC) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return "", seq, errBadSequenceFile
	}
	b = b[len(seqMagic) : len(b)-4]
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > chunkstore.MaxModelLen || int(n) > len(b)-4 {
		return "", seq, errBadSequenceFile
	}
	model := string(b[4 : 4+n])
	seq, err := fleet.DecodeSequence(b[4+n:])
	if err != nil {
		return "", seq, fmt.Errorf("%w: %w", errBadSequenceFile, err)
	}
	return model, seq, nil
}

// seqDir is the directory of the registered sequences, "" without L2.
func (s *Server) seqDir() string {
	if s.cfg.L2Dir == "" {
		return ""
	}
	return filepath.Join(s.cfg.L2Dir, seqDirName)
}

// persistSequence writes a registered sequence next to its chunks (when
// the server has an L2), atomically, once.
func (s *Server) persistSequence(model string, seq fingerprint.Sequence) {
	dir := s.seqDir()
	if dir == "" || len(seq.Keys) == 0 {
		return
	}
	path := filepath.Join(dir, seq.Keys[len(seq.Keys)-1].String()+seqExt)
	if _, err := os.Stat(path); err == nil {
		return
	}
	if err := writeFileAtomic(dir, path, encodeSequenceFile(model, seq)); err != nil {
		s.logger.Warn("sequence not kept in L2: a restart will not match it", "model", model, "err", err)
	}
}

// writeFileAtomic writes b to path through a temporary file in dir (0600).
func writeFileAtomic(dir, path string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".seq-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// restoreSequences registers again, at start-up, the sequences kept in L2
// whose chunks are all still there and removes the other files; it returns
// how many it registered.
func (s *Server) restoreSequences() (int, error) {
	dir := s.seqDir()
	if dir == "" {
		return 0, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("blend: sequences directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("blend: sequences directory: %w", err)
	}
	restored := 0
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			continue
		}
		if !strings.HasSuffix(e.Name(), seqExt) {
			if strings.HasPrefix(e.Name(), ".seq-") {
				os.Remove(path)
			}
			continue
		}
		model, seq, err := readSequenceFile(path)
		if err == nil {
			for _, k := range seq.Keys {
				if s.chunks.store.Contains(k) == chunkstore.TierNone {
					err = fmt.Errorf("chunk %s is gone", k)
					break
				}
			}
		}
		if err == nil {
			_, err = s.chunks.table(model, true).Register(seq)
		}
		if err != nil {
			s.logger.Warn("sequence in L2 dropped", "file", e.Name(), "err", err)
			os.Remove(path)
			continue
		}
		restored++
	}
	return restored, nil
}

// readSequenceFile reads and decodes one sequence file, at most
// MaxSequenceFileBytes.
func readSequenceFile(path string) (string, fingerprint.Sequence, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fingerprint.Sequence{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSequenceFileBytes+1))
	if err != nil {
		return "", fingerprint.Sequence{}, err
	}
	if len(b) > MaxSequenceFileBytes {
		return "", fingerprint.Sequence{}, fmt.Errorf("%w: over %d bytes", errBadSequenceFile, MaxSequenceFileBytes)
	}
	return decodeSequenceFile(b)
}
