#include "links.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace bevy {

namespace {

constexpr uint64_t kDirectAlign = 4096;

bool pread_all(int fd, void * dst, uint64_t nbytes, uint64_t offset, uint64_t * got, std::string & err) {
    uint64_t done = 0;
    while (done < nbytes) {
        const ssize_t n = ::pread(fd, static_cast<char *>(dst) + done, nbytes - done, (off_t) (offset + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            err = std::string("pread: ") + std::strerror(errno);
            return false;
        }
        if (n == 0) {
            break; // end of file
        }
        done += (uint64_t) n;
    }
    if (got) {
        *got = done;
    }
    return true;
}

struct AlignedBuffer {
    void *   data = nullptr;
    uint64_t size = 0;

    ~AlignedBuffer() { std::free(data); }

    bool reserve(uint64_t n) {
        if (n <= size) {
            return true;
        }
        std::free(data);
        size = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
        data = std::aligned_alloc(kDirectAlign, size);
        if (!data) {
            size = 0;
        }
        return data != nullptr;
    }
};

class FileLink final : public Link {
public:
    FileLink(int fd, bool direct) : fd_(fd), direct_(direct) {}
    ~FileLink() override { ::close(fd_); }

    bool read(uint64_t offset, uint64_t nbytes, void * dst, std::string & err) override {
        uint64_t got = 0;
        // buffered, or O_DIRECT with offset, size and buffer all aligned: straight into dst
        if (!direct_ ||
            (offset % kDirectAlign == 0 && nbytes % kDirectAlign == 0 && (uintptr_t) dst % kDirectAlign == 0)) {
            if (!pread_all(fd_, dst, nbytes, offset, &got, err)) {
                return false;
            }
            return check_len(got, nbytes, err);
        }
        // O_DIRECT needs aligned offsets, sizes and buffers: read an aligned superset and copy
        bounced_.fetch_add(1, std::memory_order_relaxed);
        thread_local AlignedBuffer bounce;
        const uint64_t first = offset / kDirectAlign * kDirectAlign;
        const uint64_t last  = (offset + nbytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
        if (!bounce.reserve(last - first)) {
            err = "out of memory for the O_DIRECT bounce buffer";
            return false;
        }
        if (!pread_all(fd_, bounce.data, last - first, first, &got, err)) {
            return false;
        }
        if (!check_len(got, offset + nbytes - first, err)) {
            return false;
        }
        std::memcpy(dst, static_cast<char *>(bounce.data) + (offset - first), nbytes);
        return true;
    }

    bool read_padded(uint64_t offset, uint64_t nbytes, void * dst, uint64_t before, uint64_t after,
                     std::string & err) override {
        const uint64_t head = offset % kDirectAlign;
        const uint64_t last = (offset + nbytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
        char * const   at   = static_cast<char *>(dst) - head;
        if (!direct_ || before < head || after < last - offset - nbytes || (uintptr_t) at % kDirectAlign != 0) {
            return read(offset, nbytes, dst, err);
        }
        // the aligned superset straight into dst's surroundings: the expert lands at dst
        uint64_t got = 0;
        if (!pread_all(fd_, at, last - (offset - head), offset - head, &got, err)) {
            return false;
        }
        return check_len(got, head + nbytes, err);
    }

    std::string describe() const override { return direct_ ? "file (O_DIRECT)" : "file (buffered: O_DIRECT refused)"; }

    uint64_t bounced() const override { return bounced_.load(std::memory_order_relaxed); }

private:
    static bool check_len(uint64_t got, uint64_t want, std::string & err) {
        if (got < want) {
            err = "short read: the model file is truncated";
            return false;
        }
        return true;
    }

    int                   fd_;
    bool                  direct_;
    std::atomic<uint64_t> bounced_{0};
};

class RamLink final : public Link {
public:
    bool read(uint64_t offset, uint64_t nbytes, void * dst, std::string & err) override {
        auto it = ranges_.upper_bound(offset);
        if (it == ranges_.begin()) {
            err = "ram link: offset outside the loaded ranges";
            return false;
        }
        --it;
        const uint64_t begin = it->first;
        const auto &   data  = it->second;
        if (offset + nbytes > begin + data.size()) {
            err = "ram link: read past the loaded range";
            return false;
        }
        std::memcpy(dst, data.data() + (offset - begin), nbytes);
        return true;
    }

    std::string describe() const override { return "ram"; }

    std::map<uint64_t, std::vector<char>> ranges_;
};

class ThrottleLink final : public Link {
public:
    ThrottleLink(std::unique_ptr<Link> inner, double rate) : inner_(std::move(inner)), rate_(rate) {}

    bool read(uint64_t offset, uint64_t nbytes, void * dst, std::string & err) override {
        return read_padded(offset, nbytes, dst, 0, 0, err);
    }

    bool read_padded(uint64_t offset, uint64_t nbytes, void * dst, uint64_t before, uint64_t after,
                     std::string & err) override {
        using clock = std::chrono::steady_clock;
        clock::time_point done;
        {
            // zero-burst token bucket: each transfer books its share of the link's time
            std::lock_guard<std::mutex> lock(mutex_);
            const auto now   = clock::now();
            const auto start = std::max(now, free_at_);
            free_at_ = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(nbytes / rate_));
            done     = free_at_;
        }
        const bool ok = inner_->read_padded(offset, nbytes, dst, before, after, err);
        std::this_thread::sleep_until(done);
        return ok;
    }

    std::string describe() const override {
        char buf[96];
        if (rate_ >= 1e9) {
            std::snprintf(buf, sizeof(buf), "emulated %.3g GB/s over ", rate_ / 1e9);
        } else {
            std::snprintf(buf, sizeof(buf), "emulated %.3g MB/s over ", rate_ / 1e6);
        }
        return buf + inner_->describe();
    }

    bool emulated() const override { return true; }

    uint64_t bounced() const override { return inner_->bounced(); }

private:
    std::unique_ptr<Link>                 inner_;
    double                                rate_;
    std::mutex                            mutex_;
    std::chrono::steady_clock::time_point free_at_{};
};

class FaultLink final : public Link {
public:
    FaultLink(std::unique_ptr<Link> inner, const FaultPlan & plan) : inner_(std::move(inner)), plan_(plan) {}

    bool read(uint64_t offset, uint64_t nbytes, void * dst, std::string & err) override {
        return read_padded(offset, nbytes, dst, 0, 0, err);
    }

    bool read_padded(uint64_t offset, uint64_t nbytes, void * dst, uint64_t before, uint64_t after,
                     std::string & err) override {
        const int64_t n = ++reads_;
        if (every(plan_.stall_every, n)) {
            std::this_thread::sleep_for(std::chrono::duration<double>(plan_.stall_s));
        }
        if (every(plan_.error_every, n)) {
            err = "I/O error (injected by the fault link: read " + std::to_string(n) + ")";
            return false;
        }
        if (every(plan_.short_every, n)) {
            const uint64_t half = nbytes / 2;
            if (half > 0 && !inner_->read(offset, half, dst, err)) {
                return false;
            }
            err = "short read: " + std::to_string(half) + " of " + std::to_string(nbytes) +
                  " bytes (injected by the fault link: read " + std::to_string(n) + ")";
            return false;
        }
        return inner_->read_padded(offset, nbytes, dst, before, after, err);
    }

    std::string describe() const override {
        std::string d = "fault-injecting (";
        auto add = [&](const char * what, int64_t every_n) {
            if (every_n > 0) {
                d += (d.back() == '(' ? "" : ", ") + std::string(what) + " every " + std::to_string(every_n) + " reads";
            }
        };
        add("errors", plan_.error_every);
        add("short reads", plan_.short_every);
        if (plan_.stall_every > 0) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.3g s stalls", plan_.stall_s);
            add(buf, plan_.stall_every);
        }
        return d + ") over " + inner_->describe();
    }

    bool emulated() const override { return true; }

    uint64_t bounced() const override { return inner_->bounced(); }

private:
    static bool every(int64_t every_n, int64_t n) { return every_n > 0 && n % every_n == 0; }

    std::unique_ptr<Link> inner_;
    FaultPlan             plan_;
    std::atomic<int64_t>  reads_{0};
};

} // namespace

std::unique_ptr<Link> make_file_link(const std::string & path, std::string & err) {
    bool direct = true;
    int  fd     = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) {
        direct = false;
        fd     = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        err = "cannot open " + path + ": " + std::strerror(errno);
        return nullptr;
    }
    if (!direct) {
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    }
    return std::make_unique<FileLink>(fd, direct);
}

std::unique_ptr<Link> make_ram_link(const std::string & path,
                                    const std::vector<std::pair<uint64_t, uint64_t>> & ranges,
                                    std::string & err) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = "cannot open " + path + ": " + std::strerror(errno);
        return nullptr;
    }
    auto link = std::make_unique<RamLink>();
    for (const auto & [offset, nbytes] : ranges) {
        std::vector<char> data(nbytes);
        uint64_t got = 0;
        if (!pread_all(fd, data.data(), nbytes, offset, &got, err) || got != nbytes) {
            if (err.empty()) {
                err = "short read: the model file is truncated";
            }
            ::close(fd);
            return nullptr;
        }
        link->ranges_.emplace(offset, std::move(data));
    }
    ::close(fd);
    return link;
}

std::unique_ptr<Link> make_throttle_link(std::unique_ptr<Link> inner, double bytes_per_s) {
    return std::make_unique<ThrottleLink>(std::move(inner), bytes_per_s);
}

std::unique_ptr<Link> make_fault_link(std::unique_ptr<Link> inner, const FaultPlan & plan) {
    return std::make_unique<FaultLink>(std::move(inner), plan);
}

} // namespace bevy
