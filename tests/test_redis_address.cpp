// kvlab serve --store redis://...: the addresses it takes and refuses (the store itself is
// tested with real replicas on a real redis-server: tests/server/test_store.py).
#include <gtest/gtest.h>

#include "kvlab/error.h"
#include "server/redis_client.h"

namespace kvlab::server {
namespace {

TEST(RedisAddress, ParsesHostPortDatabaseAndPassword) {
    const RedisAddress a = RedisAddress::parse("redis://127.0.0.1:6390/2");
    EXPECT_EQ(a.host, "127.0.0.1");
    EXPECT_EQ(a.port, 6390);
    EXPECT_EQ(a.db, 2);
    EXPECT_EQ(a.password, "");
    EXPECT_EQ(a.url, "redis://127.0.0.1:6390/2");
    const RedisAddress b = RedisAddress::parse("redis://cache.internal");
    EXPECT_EQ(b.host, "cache.internal");
    EXPECT_EQ(b.port, 6379);
    EXPECT_EQ(b.db, 0);
    const RedisAddress c = RedisAddress::parse("redis://:s3cret@[::1]:7000/");
    EXPECT_EQ(c.host, "::1");
    EXPECT_EQ(c.port, 7000);
    EXPECT_EQ(c.password, "s3cret");
    EXPECT_EQ(c.url, "redis://[::1]:7000/0");  // never the password
    EXPECT_EQ(RedisAddress::parse("redis://user:pw@h:1").password, "pw");
}

TEST(RedisAddress, RefusesWhatIsNotOne) {
    for (const char * bad : {"http://h:1", "redis://", "redis://h:0", "redis://h:65536", "redis://h:port",
                             "redis://h:1/x", "redis://[::1", "redis://[::1]x"}) {
        try {
            RedisAddress::parse(bad);
            ADD_FAILURE() << bad << " was taken";
        } catch (const Error & e) {
            EXPECT_NE(std::string(e.what()).find("give redis://[:PASSWORD@]HOST[:PORT][/DB]"), std::string::npos)
                << e.what();
        }
    }
}

TEST(RedisAddress, AnUnreachableServerIsAnErrorNamingIt) {
    // port 1 on loopback: nothing listens there, connecting is refused at once
    try {
        RedisClient c(RedisAddress::parse("redis://127.0.0.1:1/0"), 2.0);
        ADD_FAILURE() << "connected";
    } catch (const RedisError & e) {
        EXPECT_TRUE(e.unreachable);
        EXPECT_NE(std::string(e.what()).find("cannot connect to redis://127.0.0.1:1/0"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kvlab::server
