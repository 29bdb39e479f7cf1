// A small synchronous Redis client over hiredis for the shared job queue (`atelier serve --queue`,
// `atelier worker`): URL parsing, commands as argument vectors (binary-safe: user strings are never
// formatted into a command line), replies as typed values, Lua scripts by SHA with a fallback to EVAL, and
// reconnection with backoff after I/O errors. One client per thread that needs one; a client is not
// thread-safe (LockedRedis serializes one among threads where that is cheap enough).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

struct redisContext;

namespace atelier::serve::redis {

// redis://HOST[:PORT][/DB]; the port defaults to 6379, the database to 0.
struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  static Expected<RedisUrl> parse(const std::string& url);
  std::string str() const;
};

// A reply. Errors never appear here: a REDIS_REPLY_ERROR becomes a Status.
struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;                    // kString, kStatus
  int64_t integer = 0;                // kInteger
  std::vector<RedisReply> elements;   // kArray

  bool is_nil() const { return type == Type::kNil; }
  bool is_array() const { return type == Type::kArray; }
  // Strings and statuses as text, integers in decimal, nil as "".
  std::string text() const;
  // Integers, or strings holding a decimal integer; `fallback` otherwise.
  int64_t as_int(int64_t fallback = 0) const;
  // The element `i` of an array, or a nil reply when out of range / not an array.
  const RedisReply& at(size_t i) const;
};

struct RedisClientOptions {
  std::chrono::milliseconds connect_timeout{2000};
  // Longest wait for a reply; a blocking command (XREADGROUP BLOCK ms) must block for less than this.
  std::chrono::milliseconds command_timeout{10000};
  int reconnect_attempts = 5;                       // per command, before its error is returned
  std::chrono::milliseconds reconnect_backoff{100}; // doubled per attempt, at most 2 s
};

// A Lua script; its SHA1 is learned from SCRIPT LOAD on first use (and again after a Redis restart).
struct RedisScript {
  std::string source;
};

class RedisClient {
 public:
  // Connects (and SELECTs the database); the error names the address and what failed.
  static Expected<std::unique_ptr<RedisClient>> connect(const RedisUrl& url, RedisClientOptions options = {});
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command. On an I/O error the connection is re-established (with backoff) and the command
  // sent again, so commands must be safe to repeat (every write of the queue is idempotent by job id).
  Expected<RedisReply> command(const std::vector<std::string>& argv);
  // EVALSHA, loading the script when Redis does not know it.
  Expected<RedisReply> eval(const RedisScript& script, const std::vector<std::string>& keys,
                            const std::vector<std::string>& args);
  const RedisUrl& url() const { return url_; }

 private:
  RedisClient(RedisUrl url, RedisClientOptions options) : url_(std::move(url)), options_(options) {}
  Status reconnect();
  Expected<RedisReply> command_once(const std::vector<std::string>& argv, bool* io_error);

  const RedisUrl url_;
  const RedisClientOptions options_;
  redisContext* ctx_ = nullptr;
  std::vector<std::pair<const RedisScript*, std::string>> shas_;  // script -> SHA1 (cache)
};

// One client shared by several threads, one command at a time (the gateway's HTTP threads: their commands
// are short, so a lock costs less than a connection per thread).
class LockedRedis {
 public:
  explicit LockedRedis(std::unique_ptr<RedisClient> client) : client_(std::move(client)) {}
  Expected<RedisReply> command(const std::vector<std::string>& argv) {
    std::lock_guard<std::mutex> lock(mu_);
    return client_->command(argv);
  }
  Expected<RedisReply> eval(const RedisScript& s, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
    std::lock_guard<std::mutex> lock(mu_);
    return client_->eval(s, keys, args);
  }
  const RedisUrl& url() const { return client_->url(); }

 private:
  std::mutex mu_;
  std::unique_ptr<RedisClient> client_;
};

// A hash reply (HGETALL: field, value, field, value, ...) as pairs looked up by field; "" when absent.
std::string hash_field(const RedisReply& hgetall, const std::string& field);

}  // namespace atelier::serve::redis
