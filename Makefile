# zklock: PGXS build.
#
#   make && make install          against the pg_config on PATH, or
#                                 PG_CONFIG=/path/to/pg_config
#   make installcheck             the pg_regress suites (sql/, expected/)
#                                 against a running server: see CONTRIBUTING.md, Tests
#   make prove_installcheck       the TAP suites (test/t/) against the
#                                 installed server's programs, with a
#                                 ZooKeeper ensemble: see test/t/ZkTest.pm
#
# scripts/test-all sets up both and runs them for every supported major.

MODULE_big = zklock
# The SQL surface is zklock.c; the layers under it are in src/, a folder
# each, top to bottom (see CONTRIBUTING.md, Layout).  Sources include each
# other's headers by folder: #include "session/zk_session.h".
OBJS = zklock.o \
	$(patsubst %,src/interface/%.o,zk_observe zk_args) \
	$(patsubst %,src/holds/%.o,zk_guard zk_holds zk_fail_closed zk_hold_table) \
	$(patsubst %,src/recipe/%.o,zk_recipe zk_deadlock zk_acl_check zk_queue_read zk_queue) \
	$(patsubst %,src/shared/%.o,zk_shared zk_title) \
	$(patsubst %,src/session/%.o,zk_session zk_budget zk_wait zk_watchdog \
		zk_session_state zk_keeping zk_janitor zk_requests zk_settings zk_client_log \
		zk_contact zk_link) \
	$(patsubst %,src/base/%.o,zk_names zk_text zk_memory)
# The C functions only the TAP suites call (src/interface/zk_test_support.c) are
# built with ZKLOCK_TEST_SUPPORT=1, as CI and the test scripts do; never
# shipped.
ifeq ($(ZKLOCK_TEST_SUPPORT),1)
OBJS += src/interface/zk_test_support.o
endif
EXTRA_CLEAN = src/interface/zk_test_support.o src/interface/zk_test_support.bc
# A VPATH build (pg_buildext's, for the Debian package) writes the objects
# of src/ into the build directory, which needs their folders first.
ifdef VPATH
$(shell mkdir -p $(sort $(dir $(OBJS) src/interface/zk_test_support.o)))
endif
EXTENSION = zklock
DATA = zklock--1.0.sql
PGFILEDESC = "zklock - cluster-wide locks backed by Apache ZooKeeper"

REGRESS = setup session xact fencing shared observe input
REGRESS_OPTS = --load-extension=dblink --load-extension=zklock

# Warnings are errors in CI and the test scripts (COPT=-Werror), not here:
# a packager's newer compiler must not fail the build over a new warning.
PG_CPPFLAGS = -I$(srcdir)/src -DTHREADED -Wall -Wextra -Wno-unused-parameter \
	-Wno-missing-field-initializers
SHLIB_LINK = -lzookeeper_mt -lpthread

# TLS needs a ZooKeeper C client built with OpenSSL (Debian's is not):
# make ZK_TLS_PREFIX=$(scripts/build-zookeeper-tls).  Its zookeeper.h
# declares the TLS API only with HAVE_OPENSSL_H, and the rpath keeps
# Debian's library, of the same soname, from being loaded instead.  zklock
# itself loads the TLS files once with OpenSSL, to report what is wrong.
ifdef ZK_TLS_PREFIX
PG_CPPFLAGS += -DHAVE_OPENSSL_H -I$(ZK_TLS_PREFIX)/include
SHLIB_LINK = -L$(ZK_TLS_PREFIX)/lib -Wl,-rpath,$(ZK_TLS_PREFIX)/lib \
	-lzookeeper_mt -lssl -lcrypto -lpthread
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS gives COPT to the compiler only, not to the clang pass that makes
# JIT bitcode: a build asked to fail on warnings fails on clang's too.
override BITCODE_CFLAGS += $(filter -Werror,$(COPT))

# As pgvector does: the TAP suites are not part of installcheck, since they
# need an ensemble (ZKLOCK_TEST_HOSTS and friends) and make clusters of their
# own.  They live in test/t/, with their helper module; PROVE_TESTS picks
# some of them (PROVE_TESTS='test/t/001_locking.pl'), all when empty.  Each
# file's time is printed, for balancing the lanes of scripts/test-all.
override PROVE_TESTS := $(or $(PROVE_TESTS),test/t/*.pl)
PROVE_FLAGS += -I test/t --timer
.PHONY: prove_installcheck
prove_installcheck:
	$(prove_installcheck)
