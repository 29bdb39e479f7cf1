#include "serve/redis/redis_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <thread>

namespace atelier::serve::redis {
namespace {

constexpr auto kMaxBackoff = std::chrono::milliseconds(2000);

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = ms.count() / 1000;
  tv.tv_usec = (ms.count() % 1000) * 1000;
  return tv;
}

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

// Whether any element of a (nested) reply is an error; its message goes to *message.
bool find_error(const redisReply* r, std::string* message) {
  if (r->type == REDIS_REPLY_ERROR) {
    message->assign(r->str, r->len);
    return true;
  }
  if (r->type == REDIS_REPLY_ARRAY)
    for (size_t i = 0; i < r->elements; ++i)
      if (find_error(r->element[i], message)) return true;
  return false;
}

}  // namespace

Expected<RedisUrl> RedisUrl::parse(const std::string& url) {
  const std::string scheme = "redis://";
  auto bad = [&](const std::string& why) {
    return invalid_argument("queue URL '" + url + "': " + why + " (expected redis://HOST[:PORT][/DB])");
  };
  if (url.rfind(scheme, 0) != 0) return bad("only the redis:// scheme is supported");
  std::string rest = url.substr(scheme.size());
  RedisUrl u;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (!db.empty()) {
      if (db.size() > 4 || db.find_first_not_of("0123456789") != std::string::npos) return bad("the database must be a number");
      u.db = std::stoi(db);
    }
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    rest.resize(colon);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return bad("bad port");
    u.port = std::stoi(port);
    if (u.port < 1 || u.port > 65535) return bad("the port must be from 1 to 65535");
  }
  if (rest.empty()) return bad("no host");
  if (rest.find('@') != std::string::npos) return bad("credentials in the URL are not supported");
  u.host = rest;
  return u;
}

std::string RedisUrl::str() const { return "redis://" + host + ":" + std::to_string(port) + "/" + std::to_string(db); }

std::string RedisReply::text() const {
  if (type == Type::kInteger) return std::to_string(integer);
  return str;
}

int64_t RedisReply::as_int(int64_t fallback) const {
  if (type == Type::kInteger) return integer;
  if ((type == Type::kString || type == Type::kStatus) && !str.empty() && str.size() < 20 &&
      str.find_first_not_of("-0123456789") == std::string::npos)
    return std::stoll(str);
  return fallback;
}

const RedisReply& RedisReply::at(size_t i) const {
  static const RedisReply kNil;
  return type == Type::kArray && i < elements.size() ? elements[i] : kNil;
}

std::string hash_field(const RedisReply& h, const std::string& field) {
  for (size_t i = 0; i + 1 < h.elements.size(); i += 2)
    if (h.elements[i].str == field) return h.elements[i + 1].text();
  return "";
}

Expected<std::unique_ptr<RedisClient>> RedisClient::connect(const RedisUrl& url, RedisClientOptions options) {
  std::unique_ptr<RedisClient> c(new RedisClient(url, options));
  ATELIER_RETURN_IF_ERROR(c->reconnect());
  return c;
}

RedisClient::~RedisClient() {
  if (ctx_) redisFree(ctx_);
}

Status RedisClient::reconnect() {
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  const timeval tv = to_timeval(options_.connect_timeout);
  redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port, tv);
  if (!c) return internal_error("cannot connect to Redis at " + url_.str() + ": out of memory");
  if (c->err) {
    const std::string why = c->errstr;
    redisFree(c);
    return Status(ErrorCode::kResourceExhausted, "cannot connect to Redis at " + url_.str() + ": " + why);
  }
  redisSetTimeout(c, to_timeval(options_.command_timeout));
  ctx_ = c;
  shas_.clear();  // a restarted Redis has forgotten the scripts
  if (url_.db != 0) {
    bool io = false;
    auto r = command_once({"SELECT", std::to_string(url_.db)}, &io);
    if (!r) return r.status();
  }
  return Status::ok();
}

Expected<RedisReply> RedisClient::command_once(const std::vector<std::string>& argv, bool* io_error) {
  *io_error = false;
  if (!ctx_) {
    *io_error = true;
    return Status(ErrorCode::kResourceExhausted, "not connected to Redis at " + url_.str());
  }
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, int(args.size()), args.data(), lens.data()));
  if (!r) {  // I/O or protocol error: the context is unusable from here on
    *io_error = true;
    const std::string why = ctx_->errstr;
    redisFree(ctx_);
    ctx_ = nullptr;
    return Status(ErrorCode::kResourceExhausted, "Redis at " + url_.str() + ": " + why);
  }
  std::string message;
  const bool failed = find_error(r, &message);
  RedisReply out = failed ? RedisReply{} : convert(r);
  freeReplyObject(r);
  if (failed) return internal_error("Redis " + (argv.empty() ? std::string() : argv[0]) + ": " + message);
  return out;
}

Expected<RedisReply> RedisClient::command(const std::vector<std::string>& argv) {
  auto backoff = options_.reconnect_backoff;
  for (int attempt = 0;; ++attempt) {
    bool io_error = false;
    auto r = command_once(argv, &io_error);
    if (!io_error || attempt >= options_.reconnect_attempts) return r;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kMaxBackoff));
    (void)reconnect();  // a failure shows up as the next attempt's I/O error
  }
}

Expected<RedisReply> RedisClient::eval(const RedisScript& script, const std::vector<std::string>& keys,
                                       const std::vector<std::string>& args) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto it = std::find_if(shas_.begin(), shas_.end(), [&](const auto& p) { return p.first == &script; });
    if (it == shas_.end()) {
      ATELIER_ASSIGN_OR_RETURN(RedisReply sha, command({"SCRIPT", "LOAD", script.source}));
      shas_.emplace_back(&script, sha.str);
      it = shas_.end() - 1;
    }
    std::vector<std::string> argv = {"EVALSHA", it->second, std::to_string(keys.size())};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = command(argv);
    if (r || r.status().message().find("NOSCRIPT") == std::string::npos) return r;
    shas_.clear();  // Redis restarted without the script cache (or reconnect cleared it): load again
  }
  return internal_error("Redis forgot the script twice in a row");
}

}  // namespace atelier::serve::redis
