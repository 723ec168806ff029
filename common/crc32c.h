// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected as 0x82F63B78): the checksum of
// checkpoint shards and other persisted bytes. Same values as iSCSI, ext4, leveldb and
// RocksDB (before their masking): Value("123456789") == 0xE3069283.
//
// Extend uses the SSE4.2 crc32 instruction when the CPU has it (checked once, at the first
// call) and a table-driven slicing-by-8 loop otherwise; both give identical results.
// Thread-safe: no mutable state besides the one-time CPU check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace drover::crc32c {

// The CRC-32C of A + B, given crc = Value(A) and B = data[0, n). Extend(0, ...) starts a
// new checksum, so a file can be checksummed in pieces.
uint32_t Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }
inline uint32_t Value(std::string_view data) { return Extend(0, data.data(), data.size()); }

// The two implementations behind Extend, exposed so tests can check one against the other.
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
bool HardwareAvailable();
// Only when HardwareAvailable(); aborts otherwise.
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);

}  // namespace drover::crc32c
