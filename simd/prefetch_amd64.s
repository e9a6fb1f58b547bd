//go:build amd64 && !noasm

#include "textflag.h"

// func prefetchT0(p *byte, n int)
TEXT ·prefetchT0(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JLE pfdone
pfloop:
	PREFETCHT0 (SI)
	ADDQ $64, SI
	SUBQ $64, CX
	JG pfloop
pfdone:
	RET
