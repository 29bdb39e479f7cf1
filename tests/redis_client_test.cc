// The Redis client wrapper: URL parsing, binary-safe commands, typed replies, errors as Status, scripts,
// and reconnection after the server restarts (against a real redis-server).
#include <gtest/gtest.h>

#include "redis_test_util.h"
#include "serve/redis/request_codec.h"

namespace atelier::serve::redis {
namespace {

TEST(RedisClient, ParsesUrls) {
  auto u = RedisUrl::parse("redis://cache.internal:6380/3");
  ASSERT_TRUE(u) << u.status().message();
  EXPECT_EQ(u->host, "cache.internal");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 3);
  auto d = RedisUrl::parse("redis://localhost");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->port, 6379);
  EXPECT_EQ(d->db, 0);
  for (const char* bad : {"http://x:1", "redis://", "redis://h:0", "redis://h:99999", "redis://h:12/x", "redis://u:p@h:1"}) {
    auto r = RedisUrl::parse(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) EXPECT_NE(r.status().message().find("redis://HOST"), std::string::npos) << r.status().message();
  }
}

TEST(RedisClient, RequestCodecRoundTrips) {
  ServeRequest r;
  r.model = "tiny";
  r.gen.prompt = "a \"quoted\"\nprompt";
  r.gen.steps = 7;
  r.gen.seed = 1234567890123;
  r.gen.cfg_scale = 5.5f;
  r.preview = true;
  r.api = ApiFamily::kOpenAI;
  r.output_format = "webp";
  r.guidance = 2.25f;
  r.max_sequence_length = 77;
  r.cost = 6.0;
  Image img;
  img.width = 2, img.height = 1, img.channels = 3;
  img.pixels = {1, 2, 3, 4, 5, 6};
  r.init_image = img;
  r.mask = Image{2, 1, 1, {0, 255}};
  r.gen.resize_mode = "crop";
  r.gen.inpaint_fill = "latent_noise";
  r.gen.mask_blur_x = 3;
  r.gen.mask_blur_y = 5;
  r.gen.inpaint_only_masked = true;
  r.gen.inpaint_padding = 12;
  r.gen.mask_invert = true;
  r.gen.mask_round = false;
  auto back = decode_request(encode_request(r).dump());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->gen.prompt, r.gen.prompt);
  EXPECT_EQ(back->gen.steps, 7);
  EXPECT_EQ(back->gen.seed, r.gen.seed);
  EXPECT_EQ(back->gen.cfg_scale, 5.5f);
  EXPECT_TRUE(back->preview);
  EXPECT_EQ(back->api, ApiFamily::kOpenAI);
  EXPECT_EQ(back->output_format, "webp");
  EXPECT_EQ(back->guidance, 2.25f);  // FLUX's: a worker elsewhere runs the job with it
  EXPECT_EQ(back->max_sequence_length, 77);
  EXPECT_EQ(back->cost, 6.0);  // the worker's load estimate
  ASSERT_TRUE(back->init_image);
  EXPECT_EQ(back->init_image->pixels, img.pixels);
  ASSERT_TRUE(back->mask);  // inpainting: the mask and every setting of it
  EXPECT_EQ(back->mask->pixels, r.mask->pixels);
  const GenerateRequest& g = back->gen;
  EXPECT_EQ(g.resize_mode, "crop");
  EXPECT_EQ(g.inpaint_fill, "latent_noise");
  EXPECT_EQ(g.mask_blur_x, 3);
  EXPECT_EQ(g.mask_blur_y, 5);
  EXPECT_TRUE(g.inpaint_only_masked);
  EXPECT_EQ(g.inpaint_padding, 12);
  EXPECT_TRUE(g.mask_invert);
  EXPECT_FALSE(g.mask_round);
  EXPECT_FALSE(decode_request("[1]"));
  EXPECT_FALSE(decode_request(R"({"model": "tiny", "steps": "many"})"));
  EXPECT_FALSE(decode_request(R"({"prompt": "no model"})"));
}

TEST(RedisClient, CommandsAreBinarySafeAndErrorsAreStatuses) {
  ATELIER_REQUIRE_REDIS();
  auto server = test::RedisProcess::start(false);
  ASSERT_TRUE(server);
  auto c = server->client();
  ASSERT_TRUE(c);
  const std::string value("a b\0c\r\n\"%s", 11);
  ASSERT_TRUE(c->command({"SET", "k ey", value}));
  auto got = c->command({"GET", "k ey"});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->str, value);
  EXPECT_TRUE(c->command({"GET", "absent"})->is_nil());
  EXPECT_EQ(c->command({"INCRBY", "n", "41"})->as_int(), 41);
  auto err = c->command({"INCR", "k ey"});
  ASSERT_FALSE(err);
  EXPECT_NE(err.status().message().find("not an integer"), std::string::npos) << err.status().message();
  auto arr = c->command({"MGET", "n", "absent"});
  ASSERT_TRUE(arr);
  ASSERT_TRUE(arr->is_array());
  EXPECT_EQ(arr->at(0).as_int(), 41);
  EXPECT_TRUE(arr->at(1).is_nil());
  EXPECT_TRUE(arr->at(7).is_nil());
  static const RedisScript kScript{"return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}"};
  auto s = c->eval(kScript, {"key"}, {"arg", "2"});
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->at(0).str, "key");
  EXPECT_EQ(s->at(2).as_int(), 3);
  static const RedisScript kBad{"return redis.call('NOSUCHCOMMAND')"};
  EXPECT_FALSE(c->eval(kBad, {}, {}));
}

TEST(RedisClient, ReconnectsAfterTheServerRestarts) {
  ATELIER_REQUIRE_REDIS();
  auto server = test::RedisProcess::start(true);
  ASSERT_TRUE(server);
  auto c = server->client();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->command({"SET", "kept", "1"}));
  static const RedisScript kScript{"return redis.call('GET', KEYS[1])"};
  ASSERT_TRUE(c->eval(kScript, {"kept"}, {}));
  ASSERT_TRUE(server->restart());
  auto got = c->command({"GET", "kept"});  // the old connection is dead: reconnect, then the command
  ASSERT_TRUE(got) << got.status().message();
  EXPECT_EQ(got->str, "1") << "AOF keeps the write";
  auto s = c->eval(kScript, {"kept"}, {});  // the restarted server forgot the script: loaded again
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->str, "1");
}

TEST(RedisClient, ConnectErrorNamesTheAddress) {
  auto c = RedisClient::connect(*RedisUrl::parse("redis://127.0.0.1:" + std::to_string(test::free_port())));
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find("cannot connect to Redis at redis://127.0.0.1:"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace atelier::serve::redis
