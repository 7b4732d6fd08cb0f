/*
 * A name-service fault for the zklock tests, preloaded into a test
 * cluster's postmaster: looking up "slow-dns.zklock.invalid" takes 30
 * seconds and then finds nothing, as with a name server that does not
 * answer; every other name is looked up as usual.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>

#define SLOW_HOST	"slow-dns.zklock.invalid"

typedef int (*getaddrinfo_fn) (const char *, const char *,
							   const struct addrinfo *, struct addrinfo **);

int
getaddrinfo(const char *node, const char *service,
			const struct addrinfo *hints, struct addrinfo **res)
{
	getaddrinfo_fn real = (getaddrinfo_fn) dlsym(RTLD_NEXT, "getaddrinfo");

	if (node != NULL && strcmp(node, SLOW_HOST) == 0)
	{
		sleep(30);
		return EAI_NONAME;
	}
	return real(node, service, hints, res);
}
