// Links: how expert bytes cross from the slow tier to slot memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace bevy {

class Link {
public:
    virtual ~Link() = default;

    // Copy [offset, offset + nbytes) of the slow tier into dst (host memory). Thread-safe.
    // Returns false and sets err on failure.
    virtual bool read(uint64_t offset, uint64_t nbytes, void * dst, std::string & err) = 0;

    // read(), where the caller lets the link write `before` bytes ahead of dst and `after` bytes
    // past dst + nbytes as scratch: an O_DIRECT file link then reads the page-aligned superset
    // straight in when dst sits at the offset's place in a page (no bounce copy). The default
    // ignores the room.
    virtual bool read_padded(uint64_t offset, uint64_t nbytes, void * dst, uint64_t before, uint64_t after,
                             std::string & err) {
        (void) before;
        (void) after;
        return read(offset, nbytes, dst, err);
    }

    // One line for reports, e.g. "file (O_DIRECT)" or "emulated 200 MB/s over file (O_DIRECT)".
    virtual std::string describe() const = 0;

    virtual bool emulated() const { return false; }

    // reads that went through a bounce buffer (O_DIRECT with an unaligned offset, size or dst
    // and no room around dst for the aligned superset)
    virtual uint64_t bounced() const { return 0; }
};

// O_DIRECT preads of the GGUF: straight into dst when offset, size and dst are 4 KiB aligned
// (a model written with general.alignment 4096 and expert sizes in whole pages), or when
// read_padded gives room for the aligned superset around a dst at the offset's place in a page
// (real files: general.alignment 32); else through an aligned bounce buffer per thread; falls
// back to buffered reads (and says so in describe()) where the file system refuses O_DIRECT.
std::unique_ptr<Link> make_file_link(const std::string & path, std::string & err);

// Serves the given ranges of path from an in-memory copy read once at construction.
std::unique_ptr<Link> make_ram_link(const std::string & path,
                                    const std::vector<std::pair<uint64_t, uint64_t>> & ranges,
                                    std::string & err);

// A token bucket over another link: transfers proceed at most at bytes_per_s in all.
std::unique_ptr<Link> make_throttle_link(std::unique_ptr<Link> inner, double bytes_per_s);

// Faults for tests, injected into reads of another link by their count (1-based): every
// error_every-th read fails, every short_every-th returns half its bytes (and fails as a short
// read), every stall_every-th sleeps stall_s seconds first (0: never).
struct FaultPlan {
    int64_t error_every = 0;
    int64_t short_every = 0;
    int64_t stall_every = 0;
    double  stall_s     = 0.0;
};
std::unique_ptr<Link> make_fault_link(std::unique_ptr<Link> inner, const FaultPlan & plan);

} // namespace bevy
