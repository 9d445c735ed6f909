// Writing the msgpack of an op record's tensor entries without Python objects, so a GPU record
// can be completed and packed on the trace writer's thread without holding the GIL.
//
// Each value is encoded as msgpack-python's Packer(use_bin_type=True) encodes it: the smallest
// integer form, float64 for floats, str for text and bin for bytes. A record packed here decodes,
// in Python and in OpScanner, to what the same record packed by Python decodes to.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace opguard {

class MsgpackOut {
 public:
  explicit MsgpackOut(std::string& out) : out_(out) {}

  void map(size_t n) { header(n, 0x80, 0xde, 0xdf); }
  void array(size_t n) { header(n, 0x90, 0xdc, 0xdd); }
  void nil() { byte(0xc0); }
  void boolean(bool v) { byte(v ? 0xc3 : 0xc2); }

  void uint(uint64_t v) {
    if (v < 0x80) {
      byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      byte(0xcc), big_endian(v, 1);
    } else if (v <= 0xffff) {
      byte(0xcd), big_endian(v, 2);
    } else if (v <= 0xffffffffULL) {
      byte(0xce), big_endian(v, 4);
    } else {
      byte(0xcf), big_endian(v, 8);
    }
  }

  void integer(int64_t v) {
    if (v >= 0) return uint(static_cast<uint64_t>(v));
    const auto bits = static_cast<uint64_t>(v);
    if (v >= -32) {
      byte(static_cast<uint8_t>(v));
    } else if (v >= INT8_MIN) {
      byte(0xd0), big_endian(bits, 1);
    } else if (v >= INT16_MIN) {
      byte(0xd1), big_endian(bits, 2);
    } else if (v >= INT32_MIN) {
      byte(0xd2), big_endian(bits, 4);
    } else {
      byte(0xd3), big_endian(bits, 8);
    }
  }

  void float64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    byte(0xcb), big_endian(bits, 8);
  }

  // `text` must be UTF-8 (it comes from Python str objects and ASCII names).
  void str(std::string_view text) {
    const size_t n = text.size();
    if (n < 32) {
      byte(static_cast<uint8_t>(0xa0 | n));
    } else if (n <= 0xff) {
      byte(0xd9), big_endian(n, 1);
    } else if (n <= 0xffff) {
      byte(0xda), big_endian(n, 2);
    } else {
      byte(0xdb), big_endian(n, 4);
    }
    out_.append(text);
  }

  void bin(const uint8_t* data, size_t n) {
    if (n <= 0xff) {
      byte(0xc4), big_endian(n, 1);
    } else if (n <= 0xffff) {
      byte(0xc5), big_endian(n, 2);
    } else {
      byte(0xc6), big_endian(n, 4);
    }
    out_.append(reinterpret_cast<const char*>(data), n);
  }

  void raw(std::string_view bytes) { out_.append(bytes); }

 private:
  void byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void big_endian(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void header(size_t n, uint8_t fix, uint8_t b16, uint8_t b32) {
    if (n < 16) {
      byte(static_cast<uint8_t>(fix | n));
    } else if (n <= 0xffff) {
      byte(b16), big_endian(n, 2);
    } else {
      byte(b32), big_endian(n, 4);
    }
  }

  std::string& out_;
};

}  // namespace opguard
