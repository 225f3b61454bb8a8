package kernel

import (
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/klauspost/compress/huff0"
)

// tableTag is the first byte of a payload Huffman coded with the fixed
// table payloadTable: tableTag, the uvarint length n of the coded bytes,
// then the single-stream bit stream of them (RFC 8878 section 4.2.2)
// to the end of the value, with no table: the reader has it. JSON text
// never starts with it, nor does a packed value, a zstd frame or a
// payload of huffTag.
const tableTag = 0x03

// payloadTable is the description (RFC 8878 section 4.2.1, huff0's
// table header) of the fixed Huffman table of tableTag payloads: a
// format, never changed (another table needs another tag). Every byte
// value has a code, so it codes any payload. It was built from the byte
// counts of 422 packed fs.read payloads whose content was 1 KiB of this
// repository's Go sources and docs (docs/kernel.md, the text
// BenchmarkAuditStorage stores, left out), plus one of each byte value.
//
// Why a fixed table: building a table of its own for each payload (the
// histogram sorted, the tree built, its description written: huffTag)
// was two thirds of coding's CPU, ~4 µs a payload, and its description
// ~50 of the stored bytes; payloads share most of their bytes' frequency
// (member names, digests, text), so one table fits most as well.
var payloadTable = mustHexTable("4b1080569b00410484df82ae41aaaaaa6a77d4ff5f40b0bbffd912f624e422bb25ffcfd2fbcd8e9f76f29978aa5a28de201d3f76cf641a0f6c24eb5f6153722e34e39044ba4cccc027796802")

// payloadCoder holds payloadTable, tableDecoder decodes with it (a
// Decoder is stateless: every reader shares it), and tableScratch holds
// scratches that code with it (ReusePolicyMust: coding never replaces
// the table, and fails rather than code with another).
var (
	payloadCoder = readPayloadTable()
	tableDecoder = payloadCoder.Decoder()
	tableScratch = sync.Pool{New: func() any {
		s := &huff0.Scratch{Reuse: huff0.ReusePolicyMust}
		s.TransferCTable(payloadCoder)
		return s
	}}
)

// mustHexTable decodes the hex of payloadTable.
func mustHexTable(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(fmt.Sprintf("kernel: payloadTable: %v", err))
	}
	return b
}

// readPayloadTable reads payloadTable into a scratch that codes with it
// (ReadTable installs the encoding table as well as the decoding one).
func readPayloadTable() *huff0.Scratch {
	s, rest, err := huff0.ReadTable(payloadTable, nil)
	if err != nil || len(rest) != 0 {
		panic(fmt.Sprintf("kernel: payloadTable does not read as one table: %v (%d bytes left)", err, len(rest)))
	}
	return s
}

// tableCode returns p coded with payloadTable (tableTag, its length, the
// stream), or nil when that is not smaller than p.
func tableCode(p []byte) []byte {
	s := tableScratch.Get().(*huff0.Scratch)
	defer tableScratch.Put(s)
	h, _, err := huff0.Compress1X(p, s)
	if err != nil {
		return nil
	}
	return codedForm(tableTag, p, h)
}
