package dev.countersink.stack;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/**
 * The list of dynamic settings that Apicurio's config-index extension would build at build time. That
 * extension's build-time artifact is not published on Maven Central, so the list is empty: no setting of
 * the registry can be changed at run time through its admin API, which the stack never does.
 */
@ApplicationScoped
public class DynamicPropertiesProducer {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
